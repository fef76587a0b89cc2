"""Write src/tokenflow/data/corpus.txt: the small original corpus the tiny model learns from.

Simple facts, Chinese and English: national capitals (首都), capitals of China's autonomous
regions (首府, so that 府 is a real runner-up after 首) and provincial capitals (省会).
Deterministic: same file every run. Run: python scripts/build_corpus.py
"""
from pathlib import Path

COUNTRIES = [  # (国家, 首都, country, capital)
    ("中国", "北京", "China", "Beijing"), ("日本", "东京", "Japan", "Tokyo"),
    ("法国", "巴黎", "France", "Paris"), ("英国", "伦敦", "Britain", "London"),
    ("德国", "柏林", "Germany", "Berlin"), ("意大利", "罗马", "Italy", "Rome"),
    ("俄罗斯", "莫斯科", "Russia", "Moscow"), ("美国", "华盛顿", "America", "Washington"),
    ("加拿大", "渥太华", "Canada", "Ottawa"), ("埃及", "开罗", "Egypt", "Cairo"),
    ("印度", "新德里", "India", "New Delhi"), ("西班牙", "马德里", "Spain", "Madrid"),
    ("泰国", "曼谷", "Thailand", "Bangkok"), ("越南", "河内", "Vietnam", "Hanoi"),
    ("澳大利亚", "堪培拉", "Australia", "Canberra"), ("希腊", "雅典", "Greece", "Athens"),
    ("葡萄牙", "里斯本", "Portugal", "Lisbon"),
    ("荷兰", "阿姆斯特丹", "the Netherlands", "Amsterdam"),
    ("瑞典", "斯德哥尔摩", "Sweden", "Stockholm"), ("挪威", "奥斯陆", "Norway", "Oslo"),
    ("芬兰", "赫尔辛基", "Finland", "Helsinki"), ("波兰", "华沙", "Poland", "Warsaw"),
    ("土耳其", "安卡拉", "Turkey", "Ankara"), ("伊朗", "德黑兰", "Iran", "Tehran"),
    ("肯尼亚", "内罗毕", "Kenya", "Nairobi"), ("新西兰", "惠灵顿", "New Zealand", "Wellington"),
    ("蒙古", "乌兰巴托", "Mongolia", "Ulaanbaatar"), ("古巴", "哈瓦那", "Cuba", "Havana"),
]
REGIONS = [  # (自治区, 首府) — capitals of autonomous regions are called 首府
    ("西藏", "拉萨"), ("新疆", "乌鲁木齐"), ("内蒙古", "呼和浩特"), ("广西", "南宁"),
    ("宁夏", "银川"),
]
PROVINCES = [  # (省, 省会)
    ("广东", "广州"), ("浙江", "杭州"), ("江苏", "南京"), ("四川", "成都"), ("湖北", "武汉"),
    ("湖南", "长沙"), ("山东", "济南"), ("河南", "郑州"), ("福建", "福州"), ("云南", "昆明"),
    ("陕西", "西安"),
]
CITIES = ["上海", "深圳", "天津", "重庆", "大阪", "纽约"]


def sentences() -> list[str]:
    out = []
    for zh_c, zh_cap, en_c, en_cap in COUNTRIES:
        out += [f"{zh_cap}是{zh_c}的首都。", f"{zh_c}的首都是{zh_cap}。",
                f"{zh_cap}在{zh_c}。", f"{zh_cap}是一座城市。",
                f"{en_cap} is the capital of {en_c}.", f"The capital of {en_c} is {en_cap}."]
    for region, cap in REGIONS:
        out += [f"{cap}是{region}的首府。", f"{region}的首府是{cap}。",
                f"{cap}是{region}的首府，也是一座城市。", f"{cap}在中国。"]
    for prov, cap in PROVINCES:
        out += [f"{cap}是{prov}的省会。", f"{prov}的省会是{cap}。", f"{cap}在中国。"]
    for city in CITIES:
        out += [f"{city}是一座城市。", f"{city}是一座大城市。"]
    return out


if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "src" / "tokenflow" / "data" / "corpus.txt"
    path.write_text("\n".join(sentences()) + "\n", encoding="utf-8")
    print(f"wrote {path} ({len(sentences())} sentences)")
